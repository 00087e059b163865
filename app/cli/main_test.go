package cli

import (
	"testing"

	"github.com/walship/walship/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }
