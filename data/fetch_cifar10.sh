#!/usr/bin/env bash
# Downloads the CIFAR-10 binary version from "The CIFAR-10 dataset" page of Alex Krizhevsky at the
# University of Toronto, checks the archive against its published MD5, unpacks it and converts it
# to the HDF5 layout of data/README.md with hpc_train_data.
#
# usage: data/fetch_cifar10.sh [OUT_DIR]
#   OUT_DIR         where the archive, the unpacked files and cifar10.h5 go (default: data/)
#   HPC_TRAIN_DATA  (environment) the converter; default: hpc_train_data on PATH, else
#                   build/hpc_train_data next to this repository's data/
set -euo pipefail

readonly url=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
readonly md5=c32a1d4ab5d03f1284b67883e8d87530  # published on the CIFAR-10 page

die() {
  echo "fetch_cifar10.sh: error: $*" >&2
  exit 1
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out_dir=${1:-$script_dir}
mkdir -p "$out_dir" || die "cannot create $out_dir"
archive=$out_dir/cifar-10-binary.tar.gz
output=$out_dir/cifar10.h5

tool=${HPC_TRAIN_DATA:-}
if [[ -z $tool ]]; then
  if command -v hpc_train_data >/dev/null 2>&1; then
    tool=hpc_train_data
  elif [[ -x $script_dir/../build/hpc_train_data ]]; then
    tool=$script_dir/../build/hpc_train_data
  else
    die "hpc_train_data not found: build it (cmake --build build) or set HPC_TRAIN_DATA"
  fi
fi

md5_of() {
  if command -v md5sum >/dev/null 2>&1; then
    md5sum "$1" | cut -d' ' -f1
  elif command -v md5 >/dev/null 2>&1; then
    md5 -q "$1"  # macOS
  else
    openssl md5 -r "$1" | cut -d' ' -f1
  fi
}

if [[ -f $archive ]]; then
  echo "using the archive already in $archive"
else
  echo "downloading $url (about 163 MB)"
  # To a temporary name first: an interrupted download never looks complete.
  if command -v curl >/dev/null 2>&1; then
    curl -fL --retry 3 -o "$archive.part" "$url" ||
      { rm -f "$archive.part"; die "download of $url failed (curl)"; }
  elif command -v wget >/dev/null 2>&1; then
    wget -O "$archive.part" "$url" ||
      { rm -f "$archive.part"; die "download of $url failed (wget)"; }
  else
    die "neither curl nor wget is installed; download $url into $out_dir by hand"
  fi
  mv "$archive.part" "$archive"
fi

actual=$(md5_of "$archive")
[[ $actual == "$md5" ]] ||
  die "$archive has MD5 $actual, expected $md5 (a broken download? delete it and run again)"

echo "unpacking into $out_dir/cifar-10-batches-bin"
tar -xzf "$archive" -C "$out_dir" || die "cannot unpack $archive"

"$tool" convert cifar10 "$out_dir/cifar-10-batches-bin" "$output"
"$tool" inspect "$output"
