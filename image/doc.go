// Package image will build runtime images (root directories, ext4 images,
// kernels and initramfs) from TOML recipes. Nothing is implemented yet:
// the sandboxes issue builds it. Importers: appliance.
package image
