package main

import (
	"context"
	"fmt"

	"hearth/client"

	flag "github.com/spf13/pflag"
)

// agents rewind and agents branch: a session put back, or a new session
// started, as it was after a model call.

// callFlags are what rewind and branch share: which call.
type callFlags struct {
	call      int
	execution string
	asJSON    bool
}

func (cf *callFlags) add(fl *flag.FlagSet) {
	fl.IntVar(&cf.call, "call", -1, "the model call after which (counted over the session, from 1; 0 is the start)")
	fl.StringVar(&cf.execution, "execution", "", "count only this execution's calls (as the stream of 'hearth agents logs' shows them)")
	fl.BoolVar(&cf.asJSON, "json", false, "print JSON")
}

var errNoCall = usageError{"say which model call with --call N (the session's calls are numbered from 1 in the order they ran; 0 is the start)"}

func agentRewind(fl *flag.FlagSet) action {
	var cf callFlags
	cf.add(fl)
	undo := fl.Bool("undo", false, "bring the session back to where it was before its latest rewind")
	return func(inv *env) error {
		if !*undo && cf.call < 0 {
			return errNoCall
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		var rw client.Rewind
		if *undo {
			rw, err = c.UndoRewind(context.Background(), inv.args[0])
		} else {
			rw, err = c.Rewind(context.Background(), inv.args[0], cf.call, cf.execution)
		}
		if err != nil || cf.asJSON {
			return orJSON(inv, cf.asJSON, rw, err)
		}
		_, err = fmt.Fprintf(inv.stdout, "session %s is back at %s; continue with 'hearth agents resume %s \"...\"'; undo with 'hearth agents rewind %s --undo' (the state before is snapshot %s)\n",
			rw.Session, pointText(rw.To), rw.Session, rw.Session, rw.Undo)
		return err
	}
}

func agentBranch(fl *flag.FlagSet) action {
	var cf callFlags
	cf.add(fl)
	return func(inv *env) error {
		if cf.call < 0 {
			return errNoCall
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		req := client.SessionBranchRequest{Call: cf.call, Execution: cf.execution}
		if len(inv.args) > 1 {
			req.Id = inv.args[1]
		}
		br, err := c.BranchSession(context.Background(), inv.args[0], req)
		if err != nil || cf.asJSON {
			return orJSON(inv, cf.asJSON, br, err)
		}
		_, err = fmt.Fprintf(inv.stdout, "branched session %s from %s at %s; continue it with 'hearth agents resume %s \"...\"'\n",
			br.Session.Id, inv.args[0], pointText(br.From), br.Session.Id)
		return err
	}
}

func orJSON(inv *env, asJSON bool, v any, err error) error {
	if err != nil {
		return err
	}
	return printJSON(inv.stdout, v)
}

// pointText says where a rewind or branch went: "call 3 (exec-… call 3)".
func pointText(p client.CallPoint) string {
	if p.Execution == "" {
		return "snapshot " + p.Snapshot
	}
	if p.Call == 0 {
		return fmt.Sprintf("the start of %s", p.Execution)
	}
	return fmt.Sprintf("call %d (%s's call %d, snapshot %s)", p.SessionCall, p.Execution, p.Call, p.Snapshot)
}
