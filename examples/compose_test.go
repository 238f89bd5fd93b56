package examples

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
)

// Every example's docker compose file loads and validates, every service
// the example depends on has a healthcheck, and the example waits for it.
// (No compose engine runs in CI; this is what can be checked without one.)
func TestComposeFiles(t *testing.T) {
	files, err := filepath.Glob("*/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no compose files found")
	}
	for _, file := range files {
		t.Run(filepath.Dir(file), func(t *testing.T) {
			opts, err := cli.NewProjectOptions([]string{file}, cli.WithWorkingDirectory(filepath.Dir(file)))
			if err != nil {
				t.Fatal(err)
			}
			project, err := opts.LoadProject(context.Background())
			if err != nil {
				t.Fatalf("%s does not load: %v", file, err)
			}
			example, ok := project.Services["example"]
			if !ok {
				t.Fatalf("%s has no example service", file)
			}
			if len(example.DependsOn) == 0 {
				t.Errorf("the example depends on nothing")
			}
			for name, dep := range example.DependsOn {
				if dep.Condition != "service_healthy" {
					t.Errorf("the example does not wait for %s to be healthy", name)
				}
				svc, ok := project.Services[name]
				if !ok {
					t.Errorf("the example depends on a missing service %s", name)
					continue
				}
				if svc.HealthCheck == nil || len(svc.HealthCheck.Test) == 0 {
					t.Errorf("service %s has no healthcheck", name)
				}
			}
		})
	}
}
