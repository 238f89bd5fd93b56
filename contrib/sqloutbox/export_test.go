package sqloutbox

// SetBeforeCommit sets the hook that runs between a handler's completion
// and its commit.
func SetBeforeCommit(f func()) { beforeCommit = f }
