package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules enforces the architecture's import rules with go list:
// cmd -> appliance -> {agents, scheduler, vmm, fs, image}; leaf packages
// never import appliance, cmd or each other, except agents using vmm's
// interfaces (never a driver). The API code generated from the OpenAPI
// document (appliance/api) imports nothing of Hearth and only the
// appliance (its server) and the client (hearth/client) import it: cmd
// and the MCP server (appliance/mcp) reach the daemon through the client.
// The client sees only the API: nothing it links is of the daemon (not
// the workspace fs, the agent store or the machines of vmm), so what it
// decodes is what openapi.yaml says, never a daemon type's JSON tags; as
// tailscale's client/local never links ipnlocal. Test helpers
// (appliance/appliancetest, vmm/vmmtest, agents/modeltest) are for tests
// only: no other package imports them.
// The scripted stand-in for the model provider (agents/scriptedmodel) is
// not a test helper, since the demo command serves it, but nothing that
// runs agents may talk to it: only that command and modeltest import it.
// Cloud Hypervisor's generated API (vmm/chv/api) imports nothing of
// Hearth and serves only the chv driver and the double standing in for
// cloud-hypervisor (vmm/chv/chvdouble), which only its command imports.
// The VM workspace share (vmm/share) serves the VM drivers, the guest
// agent and the double only.
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Deps " "}}`, "hearth/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	generated := "hearth/appliance/api"
	helpers := map[string]bool{"hearth/appliance/appliancetest": true, "hearth/vmm/vmmtest": true, "hearth/agents/modeltest": true, "hearth/scheduler/storetest": true, "hearth/internal/pgtest": true, "hearth/internal/netnstest": true, "hearth/internal/leftovers": true}
	scripted := "hearth/agents/scriptedmodel"
	scriptedUsers := map[string]bool{"hearth/cmd/hearth-scripted-model": true, "hearth/agents/modeltest": true}
	// The client (hearth/client) links the generated API and nothing else
	// of Hearth. The MCP server (appliance/mcp) drives the daemon through
	// it; it cannot import the appliance, which mounts it at /mcp.
	apiClient := "hearth/client"
	mcpServer := "hearth/appliance/mcp"
	apiTypeUsers := map[string]bool{"hearth/appliance": true, apiClient: true}
	mcpImports := map[string]bool{apiClient: true}
	// The dashboard (appliance/dashboard) is static files and their
	// handler: the page reaches Hearth only through the API over HTTP, so
	// the package imports nothing of Hearth, and only the appliance, which
	// mounts it at /ui/, imports it.
	dashboard := "hearth/appliance/dashboard"
	under := func(pkg, root string) bool { return pkg == root || strings.HasPrefix(pkg, root+"/") }
	direct, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, "hearth/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	// Cloud Hypervisor's API code generated from its OpenAPI document
	// (vmm/chv/api) serves the chv driver (its client) and the double
	// standing in for cloud-hypervisor (its server interface); the double
	// serves only its command (and tests).
	chvAPI, chvAPIUsers := "hearth/vmm/chv/api", map[string]bool{"hearth/vmm/chv": true, "hearth/vmm/chv/chvdouble": true}
	chvDouble, chvDoubleUsers := "hearth/vmm/chv/chvdouble", map[string]bool{"hearth/vmm/chv/chvdouble/cmd/chv-double": true}
	// A VM's workspace share (vmm/share): the host side for the VM
	// drivers, the guest contract for the guest agent and the double.
	vmShare, vmShareUsers := "hearth/vmm/share", map[string]bool{"hearth/vmm/qemu": true, "hearth/vmm/chv": true, "hearth/vmm/chv/chvdouble": true, "hearth/cmd/hearth-guest": true}
	for _, line := range strings.Split(strings.TrimSpace(string(direct)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		for _, imp := range strings.Fields(imports) {
			if imp == chvAPI && !chvAPIUsers[pkg] {
				t.Errorf("%s imports %s: only the chv driver and its double use Cloud Hypervisor's generated API", pkg, imp)
			}
			if imp == vmShare && !vmShareUsers[pkg] {
				t.Errorf("%s imports %s: only the VM drivers, their guest agent and the Cloud Hypervisor double use the workspace share", pkg, imp)
			}
			if imp == chvDouble && !chvDoubleUsers[pkg] {
				t.Errorf("%s imports %s: the Cloud Hypervisor double is for its command and tests only", pkg, imp)
			}
			if imp == generated && !apiTypeUsers[pkg] {
				t.Errorf("%s imports %s: only the appliance and hearth/client use the generated API code; use the client", pkg, imp)
			}
			if pkg == mcpServer && strings.HasPrefix(imp, "hearth/") && !mcpImports[imp] {
				t.Errorf("%s imports %s: the MCP server reaches Hearth only through the API, with hearth/client", pkg, imp)
			}
			// The hearth MCP server agents reach from inside acts through
			// the Platform the appliance gives it: it imports neither the
			// runner nor the appliance.
			if pkg == "hearth/agents/inside" && (imp == "hearth/agents" || under(imp, "hearth/appliance")) {
				t.Errorf("%s imports %s: the inside MCP server acts only through its Platform", pkg, imp)
			}
			if pkg == dashboard && strings.HasPrefix(imp, "hearth/") {
				t.Errorf("%s imports %s: the dashboard reaches Hearth only through the API, from the browser", pkg, imp)
			}
			if imp == dashboard && pkg != "hearth/appliance" {
				t.Errorf("%s imports %s: only the appliance serves the dashboard", pkg, imp)
			}
			// The cluster (nodes, dispatch on River) is wired by the
			// appliance alone, and knows nothing of Hearth's packages:
			// what it runs it hands to the appliance's hooks.
			if imp == "hearth/cluster" && pkg != "hearth/appliance" {
				t.Errorf("%s imports %s: only the appliance wires the cluster", pkg, imp)
			}
			if pkg == "hearth/cluster" && strings.HasPrefix(imp, "hearth/") {
				t.Errorf("%s imports %s: the cluster reaches Hearth only through its hooks", pkg, imp)
			}
			if imp == scripted && !scriptedUsers[pkg] {
				t.Errorf("%s imports %s: the scripted model is for the demo command and tests, never for what runs agents", pkg, imp)
			}
		}
	}
	leaves := []string{"hearth/agents", "hearth/scheduler", "hearth/vmm", "hearth/fs", "hearth/image"}
	// agents reaches machines through vmm's interfaces and the guest
	// protocol every machine speaks, never through a driver.
	allowed := map[string][]string{"hearth/agents": {"hearth/vmm", "hearth/vmm/guest"}}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ":")
		for _, dep := range strings.Fields(deps) {
			if !strings.HasPrefix(dep, "hearth/") {
				continue
			}
			if under(dep, "hearth/appliance") && !under(pkg, "hearth/cmd") && !under(pkg, "hearth/appliance") && !(pkg == apiClient && dep == generated) {
				t.Errorf("%s imports %s: only cmd/ may import the appliance", pkg, dep)
			}
			if under(dep, "hearth/cmd") {
				t.Errorf("%s imports %s: nothing imports a command", pkg, dep)
			}
			if pkg == apiClient && dep != generated && !under(dep, "hearth/internal") {
				t.Errorf("%s depends on %s: the client sees only the API (appliance/api), never the daemon's packages such as fs, agents/store or vmm", pkg, dep)
			}
			if pkg == generated || pkg == chvAPI {
				t.Errorf("%s imports %s: generated code knows nothing of Hearth", pkg, dep)
			}
			if helpers[dep] && !helpers[pkg] {
				t.Errorf("%s imports %s: test helpers are for tests only", pkg, dep)
			}
			for _, leaf := range leaves {
				if !under(pkg, leaf) {
					continue
				}
				for _, other := range leaves {
					if other == leaf || !under(dep, other) {
						continue
					}
					ok := false
					for _, a := range allowed[leaf] {
						ok = ok || dep == a // these packages themselves, not the drivers under them
					}
					if !ok {
						t.Errorf("%s imports %s: leaf packages do not import each other", pkg, dep)
					}
				}
			}
		}
	}
}
