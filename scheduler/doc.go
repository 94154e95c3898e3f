// Package scheduler will run agent jobs on cron schedules with
// robfig/cron/v3, knowing nothing of what its jobs do. Nothing is
// implemented yet: the appliance issue builds it. Importers: appliance.
package scheduler
