module hearth

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/benbjohnson/immutable v0.4.3
	github.com/creack/pty v1.1.24
	github.com/dustin/go-humanize v1.1.0
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/hashicorp/yamux v0.1.2
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.49.0
)

require golang.org/x/exp v0.0.0-20220518171630-0b5c67f07fdf // indirect
