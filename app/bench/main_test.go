package bench

import (
	"os"
	"testing"

	"github.com/walship/walship/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(loopbackReaderEnv) != "" {
		os.Exit(loopbackReader())
	}
	testkit.Main(m)
}
