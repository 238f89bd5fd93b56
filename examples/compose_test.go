package examples

import (
	"context"
	"maps"
	"os"
	"os/exec"
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

// load loads file as docker compose would with profiles and env (NAME=value)
// set in its environment.
func load(t *testing.T, file string, profiles []string, env ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file}, cli.WithWorkingDirectory(filepath.Dir(file)), cli.WithProfiles(profiles), cli.WithEnv(env))
	if err != nil {
		t.Fatal(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("%s (profiles %v) does not load: %v", file, profiles, err)
	}
	return project
}

// stores are the values `make up` takes for STORE.
var stores = []string{"redis", "postgres", "dynamodb"}

// `make up` and `make down`, as `make -n` prints them, for every example
// with a compose file and every STORE: up loads the example's file with a
// profile that starts the service its store names (STORE=postgres starts
// examples/sqs's postgres), and the example is told the store; down names
// every profile (so that it removes what any up started, whatever STORE
// was, and up/down/up works), the volumes and the orphans.
func TestMakeUpDown(t *testing.T) {
	files, err := filepath.Glob("*/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		example := filepath.Dir(file)
		t.Run(example, func(t *testing.T) {
			all := load(t, file, []string{"*"})
			if n := len(all.DisabledServices); n != 0 {
				t.Fatalf("profile * leaves %d services out", n)
			}
			for _, store := range stores {
				up := makeCompose(t, "up", "EXAMPLE="+example, "STORE="+store)
				if up.file != "examples/"+file || len(up.args) == 0 || up.args[0] != "up" || !slices.Contains(up.args, "--exit-code-from") {
					t.Errorf("STORE=%s: make up runs %q", store, up.line)
					continue
				}
				project := load(t, file, up.profiles, up.env...)
				started := slices.Sorted(maps.Keys(project.Services))
				if _, ok := all.Services[store]; ok && !slices.Contains(started, store) {
					t.Errorf("STORE=%s: make up (%q) does not start service %s", store, up.line, store)
				}
				if v, ok := project.Services["example"].Environment["STORE"]; ok && (v == nil || *v != store) {
					t.Errorf("STORE=%s: make up (%q) runs the example with STORE=%v", store, up.line, ptr(v))
				}
				down := makeCompose(t, "down", "EXAMPLE="+example, "STORE="+store)
				if down.file != "examples/"+file || len(down.args) == 0 || down.args[0] != "down" ||
					!slices.Contains(down.args, "--volumes") || !slices.Contains(down.args, "--remove-orphans") {
					t.Errorf("STORE=%s: make down runs %q", store, down.line)
					continue
				}
				removed := load(t, file, down.profiles, down.env...)
				for _, name := range started {
					if _, ok := removed.Services[name]; !ok {
						t.Errorf("make up STORE=%s starts %s; make down (%q) leaves it", store, name, down.line)
					}
				}
			}
		})
	}
}

func ptr(v *string) string {
	if v == nil {
		return "(unset)"
	}
	return *v
}

// composeCommand is a docker compose command line a make target runs.
type composeCommand struct {
	line     string
	env      []string // NAME=value before the command
	file     string   // -f
	profiles []string // --profile
	args     []string // the subcommand and what follows it
}

// makeCompose returns the docker compose command `make -n target vars...`
// prints, run in the repository's root.
func makeCompose(t *testing.T, target string, vars ...string) composeCommand {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-n", "--no-print-directory", "-C", "..", target}, vars...)...)
	// Under `make test`, MAKEFLAGS holds the outer make's flags and
	// jobserver: not this make's business.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n %s %v: %v", target, vars, err)
	}
	var lines []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "docker compose") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("make -n %s %v runs %d docker compose commands, want 1:\n%s", target, vars, len(lines), out)
	}
	c := composeCommand{line: lines[0]}
	words := strings.Fields(lines[0])
	for i := 0; i < len(words); i++ {
		w := strings.Trim(words[i], "'\"")
		switch {
		case w == "docker" || w == "compose":
		case w == "-f" && i+1 < len(words):
			i++
			c.file = words[i]
		case w == "--profile" && i+1 < len(words):
			i++
			c.profiles = append(c.profiles, strings.Trim(words[i], "'\""))
		case c.file == "" && strings.Contains(w, "="):
			c.env = append(c.env, w)
		default:
			c.args = append(c.args, w)
		}
	}
	return c
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

// The README lists `make up` for every example with a compose file,
// `make down`, and the Compose version the files need.
func TestReadmeListsComposeExamples(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		if up := "`make up EXAMPLE=" + filepath.Dir(file); !strings.Contains(string(readme), up) {
			t.Errorf("README.md has no %s...`", up)
		}
	}
	for _, want := range []string{"`make down EXAMPLE=", "Compose v2.20 or later"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}
