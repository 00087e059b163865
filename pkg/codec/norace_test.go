//go:build !race

package codec_test

// raceEnabled reports whether the race detector, which allocates on its own,
// is on.
const raceEnabled = false
