package remote

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// HostKeyFile is the serving node's SSH host key, under its state
// directory; HostKeyFile+".pub" is the public half for nodes' known_hosts.
const HostKeyFile = "ssh_host_ed25519_key"

// ErrNoNodeKeys means the authorized keys file lists no key, so no node
// could ever connect.
var ErrNoNodeKeys = errors.New("no node keys authorized")

// loadHostKey reads the host key under dir, making one the first time so
// nodes that trusted it keep trusting it across restarts.
func loadHostKey(dir string) (ssh.Signer, error) {
	path := filepath.Join(dir, HostKeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return GenerateKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read host key: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("parse host key %s: %w (delete it to make a new one; nodes must then trust the new key)", path, err)
	}
	return s, nil
}

// GenerateKey writes a new ed25519 private key at path (OpenSSH format,
// mode 0600, what ssh -i and sshfs read) and its public half at
// path+".pub" in authorized_keys format.
func GenerateKey(path string) (ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("write key: %w", err)
	}
	if err := writeNew(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	if err := writeNew(path+".pub", ssh.MarshalAuthorizedKey(s.PublicKey()), 0o644); err != nil {
		return nil, err
	}
	return s, nil
}

// writeNew writes a file durably, through a temporary name so a crash
// never leaves half a key.
func writeNew(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// nodeKey is one authorized node: its key and the name in its comment.
type nodeKey struct {
	key  ssh.PublicKey
	name string
}

// readNodeKeys parses an authorized_keys file: one node key per line,
// its comment naming the node. Options are refused rather than ignored.
func readNodeKeys(path string) ([]nodeKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read node keys: %w", err)
	}
	var out []nodeKey
	for i, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		k, comment, opts, _, err := ssh.ParseAuthorizedKey(line)
		if err != nil {
			return nil, fmt.Errorf("node keys %s line %d: %w (one \"ssh-ed25519 AAAA... node-name\" per line)", path, i+1, err)
		}
		if len(opts) > 0 {
			return nil, fmt.Errorf("node keys %s line %d: options %q are not supported: remove them", path, i+1, opts)
		}
		out = append(out, nodeKey{key: k, name: comment})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("node keys %s: %w: add a node's public key", path, ErrNoNodeKeys)
	}
	return out, nil
}
