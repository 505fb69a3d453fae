// Command checkflags checks the -load.* flags `make load` is about to pass
// to BenchmarkLoad (test/load) with the benchmark's own rules
// (load.CheckFlags), so a bad LOAD_* value is refused at once, before the
// controller and the benchmark are built, with one line per bad value
// naming its variable: `make load: LOAD_NODES=abc: want a whole number ...`.
// Exit status 2 when a value is refused.
package main

import (
	"fmt"
	"os"

	"github.com/fleetrepair/fleetrepair/test/load"
)

func main() {
	bad := load.CheckFlags(os.Args[1:])
	for _, line := range bad {
		fmt.Fprintln(os.Stderr, "make load: "+line)
	}
	if len(bad) > 0 {
		os.Exit(2)
	}
}
