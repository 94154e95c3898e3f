package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	flag "github.com/spf13/pflag"

	"hearth/appliance"
)

func doctorCmd() *command {
	return &command{name: "doctor", summary: "what this host offers and the tier Hearth uses", max: -1, setup: cmdDoctor,
		example: "hearth doctor\nhearth doctor --isolation --json"}
}

// cmdDoctor says what the host offers Hearth and which tier it will use.
// It needs no daemon.
func cmdDoctor(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	isolation := fl.Bool("isolation", false, "also boot a machine of every tier this host can run and check its isolation from inside (needs root; QEMU under software emulation takes a while)")
	return func(inv *env) error { return doctor(inv.configFile(), inv.stdout, *asJSON, *isolation) }
}

func doctor(config string, stdout io.Writer, asJSON, isolation bool) error {
	cfg, err := loadConfig(config)
	if err != nil {
		return err
	}
	d := appliance.Doctor(cfg)
	var atts []appliance.Attestation
	if isolation {
		if atts, err = appliance.DoctorIsolation(context.Background(), cfg); err != nil {
			return err
		}
	}
	if asJSON {
		if isolation {
			return printJSON(stdout, struct {
				appliance.Diagnosis
				Isolation []appliance.Attestation `json:"isolation"`
			}{d, atts})
		}
		return printJSON(stdout, d)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, c := range d.Checks {
		mark := "ok"
		if !c.OK {
			mark = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, mark, c.Detail)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\ntier: %s (%s)\n", d.Tier, d.Why)
	if isolation {
		return printIsolation(stdout, atts)
	}
	return nil
}

// printIsolation shows each tier's attestation and fails if one failed:
// the daemon would not use that tier.
func printIsolation(w io.Writer, atts []appliance.Attestation) error {
	var failed []string
	for _, a := range atts {
		if a.Skipped != "" {
			fmt.Fprintf(w, "\nisolation of the %s tier: not runnable here: %s\n", a.Tier, a.Skipped)
			continue
		}
		verdict := "isolated"
		if !a.OK {
			verdict = "NOT USABLE"
			failed = append(failed, a.Tier)
		}
		fmt.Fprintf(w, "\nisolation of the %s tier: %s (%v)\n", a.Tier, verdict, a.Took.Round(time.Millisecond))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range a.Checks {
			mark := "ok"
			if !c.OK {
				mark = "FAILED"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", c.Name, mark, c.Detail)
		}
		tw.Flush()
	}
	if len(failed) > 0 {
		return fmt.Errorf("isolation check failed for the %s tier: the daemon will not use it", strings.Join(failed, ", "))
	}
	return nil
}
