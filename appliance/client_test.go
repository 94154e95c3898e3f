package appliance

import "hearth/client"

// The appliance's tests drive the daemon through its API client
// (hearth/client), as the CLI does; these names let them say it briefly.
type (
	Client               = client.Client
	Sandbox              = client.Sandbox
	CreateSandboxRequest = client.CreateSandboxRequest
	ExecRequest          = client.ExecRequest
	ExitStatus           = client.ExitStatus
	FileInfo             = client.FileInfo
	Image                = client.Image
	ImageList            = client.ImageList
	ImageManifest        = client.ImageManifest
	Package              = client.Package
	Usage                = client.Usage
	EventPage            = client.EventPage
	Credits              = client.Credits
	CreditEntry          = client.CreditEntry
	AgentReload          = client.AgentReload
	BranchRequest        = client.BranchRequest
	Checkpoint           = client.Checkpoint
	JobRequest           = client.JobRequest
	Job                  = client.Job
	AgentDefinition      = client.AgentDefinition
	Execution            = client.Execution
	DelegateRequest      = client.DelegateRequest
	ResumeRequest        = client.ResumeRequest
	SessionBranchRequest = client.SessionBranchRequest
	Limits               = client.Limits
	Event                = client.Event
	OutputFile           = client.OutputFile
	AgentSession         = client.AgentSession
	ExecutionFilter      = client.ExecutionFilter
	AgentSessionFilter   = client.AgentSessionFilter
	Schedule             = client.Schedule
	ScheduleRequest      = client.ScheduleRequest
	ScheduleRun          = client.ScheduleRun
)

var (
	NewClient     = client.New
	NewTCPClient  = client.NewTCP
	ErrDaemonDown = client.ErrDaemonDown
	Ended         = client.Ended
	FinalEvent    = client.FinalEvent
)
