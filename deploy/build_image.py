#!/usr/bin/env python3
"""Build the image without a registry, and run its roles the way a cluster would (README "Run it in production",
docs/operations.md "Building the image").

    deploy/build_image.py [--tag TAG] [--refresh-base]     (make image)
    deploy/build_image.py run TAG [-e NAME=VALUE ...] -- COMMAND...

``build`` (the default) makes a Debian trixie base with mmdebstrap from the Debian mirror apt is configured
with (cached as ``var/image/debian-trixie.tar``), imports it into buildah's store (again only when the tarball changed or the image is gone: each import is a
new base image ID, and buildah's cached layers above it would all be built again), then ``buildah build``s
deploy/Containerfile on it (chroot isolation: no daemon, no cgroups needed). Python packages come from the
package index pip is configured with; the host's CA bundle is lent to pip for the build. It prints one JSON line:
the tag, the build's seconds and the image's size.

``run`` runs COMMAND in the image the way the manifests do: as uid/gid 10001, with the image's environment and
working directory, the root filesystem mounted read-only (a read-only bind of buildah's mount of the image, in a
private mount namespace, then chroot) and a fresh tmpfs on /tmp. It shares the host's network (no network
namespace), so 127.0.0.1 reaches the host's PostgreSQL and Redis. Needs root (mount, chroot).

Missing tools (buildah, mmdebstrap) are installed from Debian's packages, as deploy/services.sh does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = "trixie"
BASE_TAG = f"localhost/debian:{SUITE}-local"
CACHE = ROOT / "var" / "image"
# passwd: groupadd/useradd of the final stage; ca-certificates: TLS to the package index.
BASE_PACKAGES = ("passwd", "ca-certificates")
UID = 10001


def sudo() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo", "-n"]


def tools_install(*commands: str) -> None:
    """apt-get install the Debian packages that provide the missing ``commands`` (named like their packages)."""
    want = [c for c in commands if not shutil.which(c)]
    if not want:
        return
    print(f"build_image: installing {' '.join(want)} (apt-get)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo(), "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*sudo(), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *want], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def apt_uris(etc: Path = Path("/etc/apt")) -> list[str]:
    """The archive URIs of apt's sources, in order: one-line ``deb`` entries and deb822 ``.sources`` files."""
    uris: list[str] = []
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in files:
        if path.is_file():
            for line in path.read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    uris.append(words[1])
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and fields.get("Enabled", "yes").lower() != "no":
                uris.extend(fields.get("URIs", "").split())
    return uris


def debian_mirror() -> str:
    """The Debian archive apt uses here (not its security or updates archives): ``DEBIAN_MIRROR`` overrides it."""
    if os.environ.get("DEBIAN_MIRROR"):
        return os.environ["DEBIAN_MIRROR"]
    uris = apt_uris()
    for uri in uris:
        if uri.rstrip("/").endswith("/debian"):
            return uri
    if uris:
        return uris[0]
    raise SystemExit("build_image: apt has no Debian source; set DEBIAN_MIRROR=http://<mirror>/debian")


def base_tarball(refresh: bool = False) -> Path:
    """The mmdebstrap base, made once and reused (delete it, or --refresh-base, for a newer one)."""
    tarball = CACHE / f"debian-{SUITE}.tar"
    if tarball.is_file() and not refresh:
        return tarball
    tools_install("mmdebstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".tar.partial")
    subprocess.run(["mmdebstrap", "--quiet", "--variant=apt", f"--include={','.join(BASE_PACKAGES)}",
                    "--format=tar", SUITE, str(partial), debian_mirror()], check=True)
    partial.replace(tarball)
    return tarball


def buildah(*args: str, capture: bool = True) -> str:
    out = subprocess.run(["buildah", *args], check=True, text=True, stdout=subprocess.PIPE if capture else None)
    return (out.stdout or "").strip()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_id(tag: str) -> str | None:
    """The full ID of the local image ``tag``, None without one."""
    out = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", tag],
                         text=True, capture_output=True, check=False)
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def import_record(tarball: Path) -> Path:
    """Next to the tarball: the image ID its last import made and the tarball's SHA-256 then."""
    return tarball.with_name(tarball.name + ".imported.json")


def base_import(tarball: Path) -> str:
    """The tarball as the image ``BASE_TAG`` (buildah has no `import`: a scratch container with the tree, committed).

    Skipped when ``BASE_TAG`` is still the image the last import of this very tarball made (same image ID, same
    SHA-256): a fresh import would get a new ID and invalidate buildah's layer cache (the pip layer: minutes)."""
    checksum = sha256(tarball)
    record_path = import_record(tarball)
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    current = image_id(BASE_TAG)
    if current and record.get("sha256") == checksum and record.get("image_id") == current:
        return BASE_TAG
    container = buildah("from", "--quiet", "scratch")
    try:
        buildah("add", "--quiet", container, str(tarball), "/")
        buildah("config", "--cmd", "/bin/bash", "--env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                "--label", f"org.gpuportal.base.sha256={checksum}", container)
        buildah("commit", "--quiet", "--rm", container, BASE_TAG)
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    record_path.write_text(json.dumps({"sha256": checksum, "image_id": image_id(BASE_TAG)}) + "\n")
    return BASE_TAG


def ca_bundle() -> Path | None:
    for name in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if name and Path(name).is_file():
            return Path(name)
    return None


def build(tag: str, refresh_base: bool = False) -> dict:
    tools_install("buildah")
    started = time.monotonic()
    base = base_import(base_tarball(refresh_base))
    argv = ["build", "--isolation", "chroot", "--layers", "--format", "docker", "-f", "deploy/Containerfile", "--build-arg", f"BASE={base}",
            "-t", tag]
    bundle = ca_bundle()
    if bundle:
        argv += ["--volume", f"{bundle}:/run/build-ca.crt:ro", "--build-arg", "PIP_CERT=/run/build-ca.crt"]
    subprocess.run(["buildah", *argv, "."], check=True, cwd=ROOT)
    seconds = time.monotonic() - started
    images = json.loads(buildah("images", "--json", tag))
    size = images[0].get("size") if images else None
    return {"tag": tag, "seconds": round(seconds, 1), "size": size}


def image_config(tag: str) -> dict:
    return json.loads(buildah("inspect", "--type", "image", tag))["OCIv1"]["config"]


# Runs as root in a private mount namespace: the image's tree read-only, /tmp a tmpfs, /proc and /dev, then
# chroot as the unprivileged user. "$1" is the image's tree; the rest is `env -i ... COMMAND`.
READ_ONLY_CHROOT = r"""
set -e
root="$1"; shift
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount --rbind /dev "$root/dev"
exec chroot --userspec=%(uid)d:%(uid)d "$root" "$@"
""" % {"uid": UID}  # noqa: UP031 a shell script: %-formatting leaves its braces and $ alone


def run(tag: str, command: list[str], extra_env: dict[str, str]) -> int:
    config = image_config(tag)
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    env.update(extra_env)
    workdir = config.get("WorkingDir") or "/"
    container = buildah("from", "--quiet", "--pull-never", tag)
    try:
        rootfs = buildah("mount", container)
        inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()),
                 "/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir, *command]
        return subprocess.run([*sudo(), "unshare", "--mount", "--propagation", "private", "--fork", "--",
                               "/bin/sh", "-c", READ_ONLY_CHROOT, "chroot", rootfs, *inner], check=False).returncode
    finally:
        subprocess.run(["buildah", "umount", container], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        parser = argparse.ArgumentParser(prog="build_image.py run")
        parser.add_argument("tag")
        parser.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("command", nargs="+")
        args = parser.parse_args(argv[1:])
        return run(args.tag, args.command, dict(item.split("=", 1) for item in args.env))
    parser = argparse.ArgumentParser(prog="build_image.py")
    parser.add_argument("--tag", default="localhost/gpu-portal:local")
    parser.add_argument("--refresh-base", action="store_true", help="make the mmdebstrap base again")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.tag, args.refresh_base)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
