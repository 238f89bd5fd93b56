package middleware

// Watermill's router runs each message on a goroutine of its own, whose
// stack starts small (2 KiB unless the runtime has seen larger ones) and
// doubles each time a call needs more, copying every frame on it. A
// message's path through the middleware and a network store's client
// (Acquire, the handler, Complete, each down to the socket) needs more
// than 8 KiB, so its stack grew three times per message, each time with
// the middleware and the client's frames on it to copy and adjust: in
// benchmarks/e2ebench (Redis, four consumers) runtime.newstack took 12% of
// the process's CPU. growStack, called first, makes the stack grow once,
// straight to 16 KiB, while it holds only the router's few frames: the
// runtime grows a stack to fit the frame that asked, and its frame is
// 8 KiB. It costs a goroutine whose stack is already that large the
// zeroing of its frame.

// growIndex is read by growStack so that its frame is kept; never written.
var growIndex int

// growStack grows the calling goroutine's stack to fit an 8 KiB frame.
//
//go:noinline
func growStack() byte {
	var frame [8 << 10]byte
	return frame[growIndex]
}
