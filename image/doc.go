// Package image builds runtime images from TOML recipes: a Debian root
// directory made with debootstrap (or copied from the parent recipe's
// image), with apt and npm packages, files, environment and a default user
// added in a chroot, then packed into an ext4 file with mkfs.ext4 -d so a VM
// can boot from it while a jail uses the directory directly.
//
// Images are cached in a directory, one subdirectory per recipe name and
// content hash, so rebuilding an unchanged recipe is free and a change to a
// recipe, a file it copies or any ancestor rebuilds it and its children.
// A build happens in a temporary directory that is renamed into place only
// when every step succeeded.
//
// Building needs root, debootstrap, chroot, mount and mkfs.ext4 on the host.
// The Debian mirror comes from the host's apt sources, never from this code.
//
// Importers: appliance only; cmd reaches images through the appliance.
package image
