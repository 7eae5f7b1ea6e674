#!/bin/sh
# install-config.sh SRC DIR - a `meson install` script (config/meson.build):
# installs SRC as DIR/swarm.json (under $DESTDIR) unless a file is already
# there, so that reinstalling never overwrites an edited configuration.
# The shipped default stays readable at <datadir>/swarm/swarm.json.
set -eu
src=$1
dir=${DESTDIR:-}$2
if [ -e "$dir/swarm.json" ]; then
	echo "Keeping $dir/swarm.json (the default is in <datadir>/swarm/swarm.json)"
	exit 0
fi
echo "Installing $src to $dir/swarm.json"
mkdir -p "$dir"
# 0644: the file holds no secret (passwords go in the environment)
cp "$src" "$dir/swarm.json.tmp"
chmod 644 "$dir/swarm.json.tmp"
mv "$dir/swarm.json.tmp" "$dir/swarm.json"
