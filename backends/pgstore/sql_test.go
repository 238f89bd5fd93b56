package pgstore

import (
	"reflect"
	"strings"
	"testing"
)

// The codes of the state and how columns are stored: a table holds them
// across releases, and every release on it reads them (a rolling upgrade
// runs two at once). Changing one makes the rows already written mean
// something else.
func TestStoredCodesNeverChange(t *testing.T) {
	if got := [3]int{stateInProgress, stateReleased, stateCompleted}; got != [3]int{1, 2, 3} {
		t.Fatalf("state codes %v: they are stored in the table and must never change", got)
	}
	if got := [3]int{howFresh, howTakeover, howReentrant}; got != [3]int{0, 1, 2} {
		t.Fatalf("how codes %v: they are stored in the table and must never change", got)
	}
}

// Every statement renders, with each name and code it uses.
func TestStatementsRender(t *testing.T) {
	for _, opts := range []Options{{Schema: DefaultSchema, Table: DefaultTable}, {Schema: `we"ird`, Table: "T", Unlogged: true}} {
		sql, err := render(newSQLData(opts))
		if err != nil {
			t.Fatal(err)
		}
		v := reflect.ValueOf(sql)
		for i := range v.NumField() {
			name, text := v.Type().Field(i).Name, v.Field(i).String()
			if strings.TrimSpace(text) == "" || strings.Contains(text, "{{") || strings.Contains(text, "<no value>") {
				t.Errorf("%s of %+v rendered as %q", name, opts, text)
			}
		}
	}
}
