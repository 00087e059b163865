package cli

import (
	"testing"

	"github.com/walship/walship/internal/testbin"
)

func TestMain(m *testing.M) { testbin.Main(m) }
