// Package appliance wires Hearth together: it reads the TOML config, opens
// the workspace store and the agents' store, mounts the host view, makes
// the machine driver that sandboxes and agent executions share, serves
// the metering model gateway and the local API on unix sockets, runs agent
// executions, and owns every lifetime. It is the only package that knows
// all the others, and only cmd/ may import it.
//
// # Layers and file names
//
// Each resource of the API is a service and its handlers, in files named
// after the resource:
//
//   - RESOURCE.go and RESOURCE_PART.go hold the service: sandboxes*.go
//     (sandboxManager), agents*.go (agentService), schedules*.go
//     (scheduleService), images.go (imageService). Its exported methods
//     are what the rest of the package calls; they take and return plain
//     values (SandboxInfo, store.Execution, ScheduleInfo, ...), never a
//     pointer to state a lock guards.
//   - RESOURCE_api.go and RESOURCE_PART_api.go hold its HTTP handlers:
//     they decode a request, call the service's exported methods and
//     encode the answer. A handler takes no service lock and reads no
//     service field.
//   - api.go is the edge: routes, request guards, streams, and apiError,
//     the one mapping from errors to API codes and HTTP statuses.
//   - errors.go has the domain errors the services return (ErrNotFound,
//     an io/fs.ErrNotExist; ErrInvalid, ErrConflict, ErrUnavailable,
//     ErrUnsupported, ErrTooLarge, ErrNoCredits), wrapped with a message
//     that says what to do. No service names an HTTP status or API code.
package appliance
