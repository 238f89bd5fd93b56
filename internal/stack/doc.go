// Package stack grows a goroutine's stack before the deep work it is
// started for.
//
// A goroutine's stack starts small (2 KiB unless the runtime has seen
// larger ones) and doubles each time a call needs more, copying every
// frame on it. A goroutine that goes down to a network client's socket,
// as a message's handler does through the middleware and a store, or a
// store's pipeline does through go-redis, needs more than 8 KiB: its stack
// grows two or three times, each time with the deep frames on it to copy
// and adjust. [Grow], called first, makes it grow once, straight to
// 16 KiB, while only a few frames are on it: the runtime grows a stack to
// fit the frame that asked, and Grow's frame is 8 KiB. It costs a
// goroutine whose stack is already that large the zeroing of its frame.
package stack
