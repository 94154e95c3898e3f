package appliance

import (
	"path/filepath"
	"sort"
	"strings"

	"hearth/agents"
)

// def returns the definition of agent name, nil if there is none.
func (a *agentService) def(name string) *agents.Definition {
	a.defsMu.RLock()
	defer a.defsMu.RUnlock()
	return a.defs[name]
}

// definitions returns the definitions as they are now; callers must not
// change the map.
func (a *agentService) definitions() map[string]*agents.Definition {
	a.defsMu.RLock()
	defer a.defsMu.RUnlock()
	return a.defs
}

// loadDefinitions reads the agents directory again and makes what it
// holds the agents: a new file adds an agent, a changed one replaces it,
// a removed one removes it. A file that does not load keeps the
// definition loaded from it before, if any, so a typo made while editing
// takes nothing away; each such file is one of the problems returned.
// Executions already running keep the definition they started with. It
// returns the names of the agents now defined.
func (a *agentService) loadDefinitions() (names, problems []string) {
	dir := a.cfg.AgentsDir()
	files, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil {
		return a.names(), []string{err.Error()}
	}
	sort.Strings(files)
	old := a.definitions()
	defs := map[string]*agents.Definition{}
	for _, f := range files {
		d, err := agents.LoadDefinition(f)
		if err == nil {
			defs[d.Name] = d
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".toml")
		if prev := old[name]; prev != nil {
			defs[name] = prev
			problems = append(problems, err.Error()+" (the agent keeps the definition loaded before)")
		} else {
			problems = append(problems, err.Error()+" (not loaded)")
		}
	}
	a.defsMu.Lock()
	a.defs = defs
	a.defsMu.Unlock()
	if a.runner != nil {
		a.runner.SetAgents(defs)
	}
	return a.names(), problems
}

// Reload reads the agent definitions again (see loadDefinitions) and
// logs what it found; the price file too, if it changed.
func (a *agentService) Reload() (names, problems []string) {
	a.reloadPrices()
	names, problems = a.loadDefinitions()
	a.log.Info("agents reloaded", "dir", a.cfg.AgentsDir(), "defined", len(names), "agents", strings.Join(names, ", "))
	for _, p := range problems {
		a.log.Warn("agents: definition not loaded", "problem", p)
	}
	return names, problems
}

// ReloadAgents reads the agent definitions again and brings the
// schedules of definitions in line.
func (d *Daemon) ReloadAgents() (names, problems []string) {
	names, problems = d.agents.Reload()
	d.sched.syncDefinitions()
	return names, problems
}
