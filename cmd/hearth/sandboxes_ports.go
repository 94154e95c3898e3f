package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	flag "github.com/spf13/pflag"

	"hearth/client"
)

// Exposed ports: a sandbox's server reached at a preview URL on the
// daemon (docs/ports.md).

func portArg(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil {
		return 0, usageError{fmt.Sprintf("port %q: give a TCP port inside the sandbox, 1 to 65535", s)}
	}
	return p, validPort(p)
}

func sbxExpose(fl *flag.FlagSet) action {
	public := fl.Bool("public", false, "also make a public link, which anyone who has it may open until revoked")
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		port, err := portArg(inv.args[1])
		if err != nil {
			return err
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		ctx := context.Background()
		id := inv.args[0]
		p, err := c.ExposePort(ctx, id, client.ExposePortRequest{Port: port, Public: *public})
		if err != nil {
			return err
		}
		si, err := c.SignInPort(ctx, id, port)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(inv.stdout, map[string]any{"port": p, "signin": si})
		}
		fmt.Fprintln(inv.stdout, p.Url)
		fmt.Fprintf(inv.stderr, "sandbox %s port %d is at %s (it needs the API token as bearer, or a browser signed in)\n", id, port, p.Url)
		fmt.Fprintf(inv.stderr, "sign a browser in (once, within 2 minutes): %s\n", si.Url)
		if p.PublicUrl != "" {
			fmt.Fprintf(inv.stderr, "public link (anyone who has it, until 'hearth sandboxes unexpose --public %s %d'): %s\n", id, port, p.PublicUrl)
		}
		return nil
	}
}

func sbxPorts(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		list, err := c.Ports(context.Background(), inv.args[0])
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []client.ExposedPort{}
			}
			return printJSON(inv.stdout, list)
		}
		if len(list) == 0 {
			fmt.Fprintf(inv.stdout, "no exposed ports in sandbox %s: expose one with 'hearth sandboxes expose %s PORT'\n", inv.args[0], inv.args[0])
			return nil
		}
		tw := tabwriter.NewWriter(inv.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PORT\tURL\tPUBLIC")
		for _, p := range list {
			pub := "-"
			if p.PublicUrl != "" {
				pub = p.PublicUrl
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", p.Port, p.Url, pub)
		}
		return tw.Flush()
	}
}

func sbxUnexpose(fl *flag.FlagSet) action {
	public := fl.Bool("public", false, "only revoke the public link; the port stays exposed")
	return func(inv *env) error {
		port, err := portArg(inv.args[1])
		if err != nil {
			return err
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		id := inv.args[0]
		if *public {
			if _, err := c.RevokePublicPort(context.Background(), id, port); err != nil {
				return err
			}
			fmt.Fprintf(inv.stderr, "revoked the public link of sandbox %s port %d\n", id, port)
			return nil
		}
		if _, err := c.ClosePort(context.Background(), id, port); err != nil {
			return err
		}
		fmt.Fprintf(inv.stderr, "closed sandbox %s port %d\n", id, port)
		return nil
	}
}

// codeServerPort is where `hearth sandboxes code` has code-server listen
// in the sandbox, unless told otherwise.
const codeServerPort = 8443

// sbxCode starts code-server in the sandbox as its user (unless one runs
// already), exposes its port and prints the preview URL. code-server
// comes from an image that has it (the code-server recipe): a sandbox
// without it is told so.
func sbxCode(fl *flag.FlagSet) action {
	port := fl.Int("port", codeServerPort, "the port code-server listens on in the sandbox")
	dir := fl.String("dir", "", "the folder to open (default: the sandbox's session in /workspace/agents, or the home)")
	return func(inv *env) error {
		if err := validPort(*port); err != nil {
			return err
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		ctx := context.Background()
		id := inv.args[0]
		sb, err := c.Sandbox(ctx, id)
		if err != nil {
			return err
		}
		var found strings.Builder
		st, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"sh", "-c", "command -v code-server"}}, &found, io.Discard)
		if err != nil {
			return err
		}
		if st.Code != 0 {
			return fmt.Errorf("sandbox %s has no code-server (image %s): create one from an image that has it, e.g. 'hearth images build code-server' then 'hearth sandboxes create --image code-server'", id, sb.Image)
		}
		folder := *dir
		if folder == "" && sb.Session != "" {
			folder = "/workspace/agents/" + sb.Session
		}
		running, err := codeServerJob(ctx, c, id, *port)
		if err != nil {
			return err
		}
		if running == "" {
			argv := []string{"code-server", "--bind-addr", fmt.Sprintf("127.0.0.1:%d", *port), "--auth", "none", "--disable-telemetry", "--disable-update-check"}
			if folder != "" {
				argv = append(argv, folder)
			}
			// No password of its own: the preview lets in only the
			// operator (the API token or a signed-in browser).
			j, err := c.StartJob(ctx, id, client.JobRequest{Argv: argv})
			if err != nil {
				return err
			}
			running = j.Id
			fmt.Fprintf(inv.stderr, "started code-server in sandbox %s (job %s); it takes a few seconds to answer\n", id, j.Id)
		}
		p, err := c.ExposePort(ctx, id, client.ExposePortRequest{Port: *port})
		if err != nil {
			return err
		}
		si, err := c.SignInPort(ctx, id, *port)
		if err != nil {
			return err
		}
		fmt.Fprintln(inv.stdout, p.Url)
		fmt.Fprintf(inv.stderr, "code-server of sandbox %s is at %s; open it in a browser (signs in once, within 2 minutes):\n%s\n", id, p.Url, si.Url)
		fmt.Fprintf(inv.stderr, "its log: 'hearth sandboxes job logs %s %s --stderr'\n", id, running)
		return nil
	}
}

func validPort(p int) error {
	if p < 1 || p > 65535 {
		return usageError{fmt.Sprintf("port %d: give a TCP port inside the sandbox, 1 to 65535", p)}
	}
	return nil
}

// codeServerJob returns the id of a running code-server job on port in
// the sandbox, or "".
func codeServerJob(ctx context.Context, c *client.Client, id string, port int) (string, error) {
	jobs, err := c.Jobs(ctx, id)
	if err != nil {
		return "", err
	}
	bind := fmt.Sprintf("127.0.0.1:%d", port)
	for _, j := range jobs {
		if j.State == "running" && len(j.Argv) > 2 && j.Argv[0] == "code-server" && j.Argv[2] == bind {
			return j.Id, nil
		}
	}
	return "", nil
}
