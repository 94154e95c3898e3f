package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// agentExecution prints an execution's whole event log with timestamps;
// --follow goes on with new events until it ends.
func agentExecution(fl *flag.FlagSet) action {
	asJSON := fl.Bool("json", false, "print each event as a line of JSON")
	follow := fl.BoolP("follow", "f", false, "go on with new events until the execution ends")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		p := eventPrinter{w: inv.stdout, absolute: true}
		show := func(ev client.Event) error {
			if *asJSON {
				b, _ := json.Marshal(ev)
				_, err := fmt.Fprintf(inv.stdout, "%s\n", b)
				return err
			}
			p.print(ev)
			return nil
		}
		if *follow {
			err := c.FollowEvents(ctx, inv.args[0], 0, show)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		var after int64
		for {
			page, err := c.Events(ctx, inv.args[0], after, 1000)
			if err != nil {
				return err
			}
			for _, ev := range page.Events {
				show(ev)
			}
			if len(page.Events) == 0 {
				return nil
			}
			after = page.NextAfter
		}
	}
}

// eventPrinter writes events for people, one line each (a tool's output
// gets its first line): with their time of day, or with the time since
// start.
type eventPrinter struct {
	w        io.Writer
	absolute bool
	start    time.Time
}

func (p eventPrinter) print(ev client.Event) {
	what, text := describe(ev)
	if what == "" {
		return
	}
	stamp := fmt.Sprintf("%6s", duration(ev.Time.Sub(p.start)))
	if p.start.IsZero() || ev.Time.Before(p.start) {
		stamp = fmt.Sprintf("%6s", "")
	}
	if p.absolute {
		stamp = ev.Time.Local().Format("2006-01-02 15:04:05.000")
	}
	fmt.Fprintf(p.w, "%s  %-7s %s\n", stamp, safe(what), safe(text))
}

// describe is an event's kind and one line about it; "" for an event not
// worth a line.
func describe(ev client.Event) (string, string) {
	var p map[string]any
	json.Unmarshal(ev.Payload, &p)
	str := func(k string) string { s, _ := p[k].(string); return s }
	num := func(k string) float64 { f, _ := p[k].(float64); return f }
	switch ev.Type {
	case "status":
		return "status", describeStatus(p)
	case "text":
		return "text", oneLine(str("text"), 200)
	case "tool_call":
		return "tool", str("name") + ": " + toolInput(p["input"])
	case "tool_result":
		return "result", toolOutput(str("output"), p["is_error"] == true)
	case "file":
		return "file", str("op") + " " + str("path")
	case "model_call":
		return "model", describeCall(p, str, num)
	case "budget":
		return "budget", describeBudget(str("limit"), str("level"), num("used"), num("max"))
	case "error":
		return "error", oneLine(str("message"), 300)
	case "network":
		return "network", fmt.Sprintf("%s %s: %v %s", str("method"), str("host"), p["allowed"], str("reason"))
	case "output":
		return str("stream"), oneLine(str("line"), 200)
	case "retry":
		return "retry", describeRetry(str, num)
	case "warning":
		return "warning", oneLine(str("message"), 300)
	case "system":
		b, _ := json.Marshal(p["payload"])
		if p["truncated"] == true {
			b = []byte(str("snippet"))
		}
		return "system", oneLine(str("subtype")+" "+string(b), 200)
	case "child":
		if str("status") == "pending" {
			return "child", fmt.Sprintf("%s (%s) started in %s", str("execution"), str("agent"), str("session"))
		}
		line := fmt.Sprintf("%s (%s) %s, %s", str("execution"), str("agent"), str("status"), usd(num("usd")))
		if e := str("error"); e != "" {
			line += ": " + oneLine(e, 200)
		}
		return "child", line
	case "claim":
		return "claim", describeClaim(str)
	}
	return ev.Type, oneLine(string(ev.Payload), 200)
}

// describeClaim is a lease's event: "claimed s1/outputs/a.md until 15:04:05".
func describeClaim(str func(string) string) string {
	s := strings.ReplaceAll(str("op"), "_", " ") + " " + str("path")
	switch str("op") {
	case "claimed", "renewed", "taken_over":
		if t, err := time.Parse(time.RFC3339Nano, str("expires")); err == nil {
			s += " until " + t.Local().Format("15:04:05")
		}
	}
	switch {
	case str("op") == "taken_over":
		s += fmt.Sprintf(" by %s (%s's lease had expired)", str("holder"), str("previous"))
	case str("by") == "operator":
		s += " by an operator"
	case str("by") == "end":
		s += " as the execution ended"
	}
	return s
}

func describeStatus(p map[string]any) string {
	status, _ := p["status"].(string)
	switch status {
	case "running":
		if p["resumed"] == true {
			return "running again after a top-up"
		}
		return fmt.Sprintf("running agent %v with %v", p["agent"], p["model"])
	case "awaiting_budget":
		used, _ := p["used"].(float64)
		max, _ := p["max"].(float64)
		return fmt.Sprintf("awaiting budget: %s of %s spent; its model call is held and the agent stopped for up to %v: raise the limit with 'hearth agents topup EXECUTION USD'",
			usd(used), usd(max), p["wait"])
	case "agent_started":
		return fmt.Sprintf("the agent started (%v, claude code %v)", p["model"], p["claude_code_version"])
	case "agent_finished":
		// num_turns is the CLI's own count, not the model calls the
		// limit counts: shown under its own name.
		n, _ := p["num_turns"].(float64)
		return fmt.Sprintf("the agent finished: %v (CLI turns: %d)", p["outcome"], int(n))
	}
	if e, _ := p["error"].(string); e != "" && e != status {
		return status + ": " + oneLine(e, 300)
	}
	return status
}

// describeRetry is the CLI's api_retry line: which attempt, after what,
// how long it waits.
func describeRetry(str func(string) string, num func(string) float64) string {
	why := str("error")
	if st := num("status"); st > 0 {
		why = strings.TrimSpace(fmt.Sprintf("HTTP %d %s", int(st), why))
	}
	if why == "" {
		why = "no answer"
	}
	return fmt.Sprintf("the CLI retries a model call (%s): attempt %d of %d in %s", oneLine(why, 120), int(num("attempt")), int(num("max_retries")),
		latency(time.Duration(num("delay_ms"))*time.Millisecond))
}

func describeCall(p map[string]any, str func(string) string, num func(string) float64) string {
	if str("phase") == "start" {
		return fmt.Sprintf("%s: call started (at most %s)", str("model"), usd(num("max_usd")))
	}
	s := fmt.Sprintf("%s: %s in / %s out tokens, %s, %s", str("model"), humanize.Comma(int64(num("input_tokens"))),
		humanize.Comma(int64(num("output_tokens"))), usd(num("usd")), latency(time.Duration(num("latency_ms"))*time.Millisecond))
	if st := num("status"); st != 200 {
		s += fmt.Sprintf(" (HTTP %d: %s)", int(st), oneLine(str("error"), 120))
	}
	if p["cut"] == true {
		s += " [cut]"
	}
	return s
}

// latency is a model call's time: "850ms", "12.3s".
func latency(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return duration(d)
}

func describeBudget(limit, level string, used, max float64) string {
	amount := func(v float64) string {
		if limit == "usd" || limit == "credits" {
			return usd(v)
		}
		return fmt.Sprint(v)
	}
	name := limit
	if limit == "turns" {
		name = "model calls" // the turns limit counts model calls
	}
	switch level {
	case "exceeded":
		could := ""
		if limit == "usd" || limit == "credits" { // the hard cap stops before a call that could pass it
			could = ", or the next call could pass it"
		}
		return fmt.Sprintf("%s limit reached (%s of %s%s): model calls refused, the agent is stopped", name, amount(used), amount(max), could)
	case "topped_up":
		return fmt.Sprintf("%s limit raised to %s (%s spent)", name, amount(max), amount(used))
	}
	return fmt.Sprintf("%s at %s of %s: the agent is told to wrap up", name, amount(used), amount(max))
}

// toolInput shows what a tool was asked: a command, a path, or its JSON.
func toolInput(in any) string {
	if m, ok := in.(map[string]any); ok {
		for _, k := range []string{"command", "file_path", "path", "pattern", "url", "query"} {
			if s, ok := m[k].(string); ok {
				return firstLine(s, 160)
			}
		}
	}
	b, _ := json.Marshal(in)
	return oneLine(string(b), 160)
}

// toolOutput is a tool's output's first line, and how much more there is.
func toolOutput(out string, isError bool) string {
	s := firstLine(out, 140)
	if isError {
		s = "error: " + s
	}
	return s
}

// firstLine is text's first line, and how many more there are.
func firstLine(text string, max int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	s := oneLine(lines[0], max)
	if len(lines) > 1 {
		s += fmt.Sprintf(" (+%d lines)", len(lines)-1)
	}
	return s
}
