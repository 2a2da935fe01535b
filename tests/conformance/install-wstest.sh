#!/bin/sh
# Builds wstest (Autobahn|Testsuite 0.8.2, Python 2 only) under DIR, touching nothing outside it:
# Debian bullseye's python2.7 .debs are downloaded with apt-get (a private source list and
# package lists) and unpacked with dpkg -x, pip 20.3.4 (the last for 2.7) comes from PyPI, and
# requirements-py2.txt's pins are installed with it. DIR/wstest, written last, runs it.
#   sh tests/conformance/install-wstest.sh .conformance
set -eu
dir=$(realpath -m "$1")
here=$(dirname "$(realpath "$0")")
py2=$dir/py2
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs" "$dir/wheels"

echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian bullseye main" > "$dir/apt/bullseye.list"
apt() {
    apt-get -q -o Dir::Etc::sourcelist="$dir/apt/bullseye.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" "$@"
}
apt update
# python2.7 with its standard library and headers (two dependencies compile), and the two
# libraries bullseye's build links that bookworm no longer has.
(cd "$dir/debs" && apt download python2.7 python2.7-minimal libpython2.7-stdlib \
    libpython2.7-minimal python2.7-dev libpython2.7-dev libpython2.7 libssl1.1 libffi7)
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$py2"; done

cat > "$dir/python2" <<WRAPPER
#!/bin/sh
export LD_LIBRARY_PATH="$py2/usr/lib/x86_64-linux-gnu" PYTHONHOME="$py2/usr"
export CFLAGS="-I$py2/usr/include/python2.7 -I$py2/usr/include" PYTHONWARNINGS=ignore
exec "$py2/usr/bin/python2.7" "\$@"
WRAPPER
chmod +x "$dir/python2"

python3 -m pip download --quiet --no-deps --dest "$dir/wheels" pip==20.3.4
pip="$dir/python2 -m pip --disable-pip-version-check --no-python-version-warning"
"$dir/python2" "$dir/wheels/pip-20.3.4-py2.py3-none-any.whl/pip" install --quiet \
    --no-warn-script-location "$dir/wheels/pip-20.3.4-py2.py3-none-any.whl"
$pip install --quiet --no-warn-script-location setuptools==44.1.1 wheel==0.37.1
$pip install --quiet --no-warn-script-location -r "$here/requirements-py2.txt"

cat > "$dir/wstest" <<WRAPPER
#!/bin/sh
exec "$dir/python2" "$py2/usr/local/bin/wstest" "\$@"
WRAPPER
chmod +x "$dir/wstest"
"$dir/wstest" --autobahnversion
