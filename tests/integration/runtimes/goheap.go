package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
static void flush(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memtally_flush");
	if (f)
		f();
}
*/
import "C"

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
)

type node struct {
	next *node
	a, b int64
	pad  [4]int64
}

var held []*node

func main() {
	in := bufio.NewScanner(os.Stdin)
	C.flush()
	fmt.Println("ready")
	for in.Scan() {
		switch in.Text() {
		case "hold":
			held = make([]*node, 0, 4<<20)
			for i := 0; i < 4<<20; i++ {
				held = append(held, &node{a: int64(i)})
			}
			fmt.Println("ok held")
		case "drop":
			held = nil
			runtime.GC()
			debug.FreeOSMemory()
			fmt.Println("ok dropped")
		case "flush":
			C.flush()
			fmt.Println("ok flushed")
		case "exit":
			return
		}
	}
}
