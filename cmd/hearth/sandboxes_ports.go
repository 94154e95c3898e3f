package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"

	"hearth/client"
)

// Exposed ports: a sandbox's server reached at a preview URL on the
// daemon (docs/ports.md).

func portArg(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, usageError{fmt.Sprintf("port %q: give a TCP port inside the sandbox, 1 to 65535", s)}
	}
	return p, nil
}

func sbxExpose(fl *flag.FlagSet) action {
	public := fl.Bool("public", false, "also make a public link, which anyone who has it may open until revoked")
	asJSON := fl.Bool("json", false, "print JSON")
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
	asJSON := fl.Bool("json", false, "print JSON")
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
