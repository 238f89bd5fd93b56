package main

import (
	"strings"
	"testing"
)

func TestTidySum(t *testing.T) {
	isSibling := func(p string) bool { return strings.HasPrefix(p, "example.com/root") }
	before := "example.com/a v1.0.0 h1:old=\n" +
		"example.com/root v0.1.0 h1:released=\n" +
		"example.com/root v0.1.0/go.mod h1:releasedmod=\n"
	tidied := "example.com/a v1.10.0 h1:new=\n" +
		"example.com/a v1.10.0/go.mod h1:newmod=\n" +
		"example.com/a v1.9.0/go.mod h1:ninemod=\n" +
		"example.com/root v0.1.0 h1:thistree=\n" +
		"example.com/z v0.0.1 h1:z=\n"
	got := string(tidySum([]byte(before), []byte(tidied), isSibling))
	want := "example.com/a v1.9.0/go.mod h1:ninemod=\n" +
		"example.com/a v1.10.0 h1:new=\n" +
		"example.com/a v1.10.0/go.mod h1:newmod=\n" +
		"example.com/root v0.1.0 h1:released=\n" +
		"example.com/root v0.1.0/go.mod h1:releasedmod=\n" +
		"example.com/z v0.0.1 h1:z=\n"
	if got != want {
		t.Errorf("tidySum:\n%s\nwant:\n%s", got, want)
	}
	if got := tidySum(nil, nil, isSibling); got != nil {
		t.Errorf("tidySum of nothing = %q", got)
	}
}
