package examples

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// Every example's docker compose file loads and validates, with and
// without each of its profiles. The example waits for every service it
// depends on to be healthy, and each has a healthcheck; a dependency may be
// missing only if it is optional (a service of a profile not chosen). No
// service publishes a port: the example reaches its services on the
// compose network, and the host's own Redis or Postgres keeps its port.
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
		base := load(t, file, nil)
		profileSets := [][]string{nil}
		for _, name := range base.DisabledServiceNames() {
			for _, p := range base.DisabledServices[name].Profiles {
				if !slices.ContainsFunc(profileSets, func(s []string) bool { return slices.Contains(s, p) }) {
					profileSets = append(profileSets, []string{p})
				}
			}
		}
		for _, profiles := range profileSets {
			t.Run(filepath.Dir(file)+"/profiles="+strings.Join(profiles, ","), func(t *testing.T) {
				project := load(t, file, profiles)
				checkProject(t, project)
				for _, p := range profiles {
					enabled := false
					for _, svc := range project.Services {
						enabled = enabled || slices.Contains(svc.Profiles, p)
					}
					if !enabled {
						t.Errorf("profile %s starts no service", p)
					}
				}
			})
		}
	}
}

func load(t *testing.T, file string, profiles []string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file}, cli.WithWorkingDirectory(filepath.Dir(file)), cli.WithProfiles(profiles))
	if err != nil {
		t.Fatal(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("%s (profiles %v) does not load: %v", file, profiles, err)
	}
	return project
}

func checkProject(t *testing.T, project *types.Project) {
	t.Helper()
	example, ok := project.Services["example"]
	if !ok {
		t.Fatal("no example service")
	}
	if len(example.DependsOn) == 0 {
		t.Errorf("the example depends on nothing")
	}
	for name, dep := range example.DependsOn {
		svc, ok := project.Services[name]
		if !ok {
			if dep.Required {
				t.Errorf("the example requires a service %s that is not started", name)
			}
			continue
		}
		if dep.Condition != "service_healthy" {
			t.Errorf("the example does not wait for %s to be healthy", name)
		}
		if svc.HealthCheck == nil || len(svc.HealthCheck.Test) == 0 {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	for name, svc := range project.Services {
		if len(svc.Ports) > 0 {
			t.Errorf("service %s publishes ports %v", name, svc.Ports)
		}
	}
}
