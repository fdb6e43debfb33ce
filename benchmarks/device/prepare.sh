#!/usr/bin/env bash
# Run in the project's root on a machine with the package registry, before benchmarks/device/run.sh on a GPU
# machine without one (16 cores, one H200, Python 3.12 with PyTorch, torchvision, Pillow, OpenCV, pandas,
# scikit-image and scikit-learn). Fills .dev/ (ignored by git, about 15 MB):
#   .dev/whl   cp312 wheels of what that machine lacks: outcore's dependencies, py-spy, a setuptools that builds
#              outcore and Keras (its torch backend's GPU test) (EXTRA="name ..." adds)
#   .dev/jpeg  libjpeg-turbo's headers and library (outcore's C extension builds against them there)
# Then carry .dev/ there with the tree (the device tool: carry [".dev"]) and run: bash benchmarks/device/run.sh
set -eu
git rev-parse --show-toplevel >/dev/null
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.dev/' "$exclude" 2>/dev/null || echo '/.dev/' >> "$exclude"
mkdir -p .dev/whl .dev/jpeg/include .dev/jpeg/lib
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64"
platforms="$platforms --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64"
for package in dask distributed zarr numcodecs crc32c simplejpeg donfig tblib zict partd locket tornado \
               google-crc32c msgspec py-spy setuptools \
               keras absl-py rich markdown-it-py mdurl pygments namex h5py optree ml-dtypes ${EXTRA:-}; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
        -d .dev/whl "$package"
done
debs=$(mktemp -d)
(cd "$debs" && apt-get download -q libjpeg62-turbo-dev libjpeg62-turbo >/dev/null 2>&1)
for deb in "$debs"/*.deb; do dpkg -x "$deb" "$debs/x"; done
cp "$debs"/x/usr/include/*.h .dev/jpeg/include/
cp "$debs"/x/usr/include/x86_64-linux-gnu/jconfig.h .dev/jpeg/include/
cp -a "$debs"/x/usr/lib/x86_64-linux-gnu/libjpeg.so* .dev/jpeg/lib/
rm -rf "$debs"
du -sh .dev
