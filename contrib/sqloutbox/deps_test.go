package sqloutbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A Postgres-only program links no MySQL driver: the MySQL outbox is
// package mysqloutbox, and package sqloutbox imports nothing of it.
func TestPostgresOutboxLinksNoMySQL(t *testing.T) {
	const pkg = "github.com/watermill-idempotency/idempotency/contrib/sqloutbox"
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps %s listed %d packages: %v", pkg, len(deps), deps)
	}
	for _, d := range deps {
		if strings.Contains(d, "go-sql-driver/mysql") || strings.HasSuffix(d, "/mysqlstore") || strings.HasSuffix(d, "/mysqloutbox") {
			t.Errorf("package sqloutbox depends on %s", d)
		}
	}
}
