// Command realkube builds the images of the realkube test cluster:
//
//	go run ./internal/realkube/cmd/realkube images DIR
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/walship/walship/internal/realkube"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] != "images" {
		fmt.Fprintln(os.Stderr, "usage: realkube images DIR")
		os.Exit(2)
	}
	paths, err := realkube.BuildImages(context.Background(), ".", os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, p := range paths {
		fmt.Println(p)
	}
}
