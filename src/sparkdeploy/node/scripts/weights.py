"""Node-side helper for `weights`: runs as `python3 -c <this file> CMD ...` on a node (stdlib only, Python >= 3.8).

  manifest DIR         {"files": {rel: [size, sha256]}, "bytes": N, "hashed": bytes hashed now}
                       Hashes are cached in ~/.cache/sparkdeploy/manifest-<id>.json keyed by (size, mtime_ns,
                       inode), so an unchanged checkpoint is re-listed without reading it. Every file read for
                       hashing has its page cache dropped afterwards: hashing must not fill unified memory.
  seed DIR             stdin {rel: [size, sha256]}: record hashes rsync just verified, for files whose size matches
  evict DIR            drop DIR's page cache (fdatasync + posix_fadvise DONTNEED); no root needed.
                       {"files", "bytes", "cached_before", "cached_after", "mem_available_before", "mem_available_after"}
  unauthorize MARKER   remove the authorized_keys line ending in MARKER (the sync's temporary key)
  authorize [DIR]      append the authorized_keys line on stdin (the sync's temporary key); with DIR also
                       create it and answer its manifest (one round trip)
  finish DIR MARKER    seed (stdin) + unauthorize MARKER + manifest DIR, as {"seeded", "removed", "manifest"}

Prints one JSON object on stdout.
"""

import hashlib
import json
import mmap
import os
import re
import sys

CHUNK = 8 << 20
SKIP_DIRS = {".rsync-partial"}


RSYNC_TMP = re.compile(r"^\..+\.[A-Za-z0-9]{6}$")  # rsync's in-flight temp files: .<name>.XXXXXX


def _files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if RSYNC_TMP.match(name):
                continue
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                yield os.path.relpath(path, root), path


def _drop(fd):
    try:
        os.fdatasync(fd)
    except OSError:
        pass
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _cache_path(root):
    base = os.path.join(os.path.expanduser("~"), ".cache", "sparkdeploy")
    return os.path.join(base, "manifest-" + hashlib.sha1(os.path.realpath(root).encode()).hexdigest()[:16] + ".json")


def _load_cache(root):
    try:
        with open(_cache_path(root)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_cache(root, cache):
    path = _cache_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(cache, f)
    os.replace(tmp, path)


def _key(st):
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def sha256_file(path):
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            h.update(b)
        _drop(fd)
    finally:
        os.close(fd)
    return h.hexdigest()


def manifest(root):
    if not os.path.isdir(root):
        return {"files": {}, "bytes": 0, "hashed": 0, "exists": False}
    cache, files, hashed, total = _load_cache(root), {}, 0, 0
    fresh = {}
    for rel, path in _files(root):
        st = os.stat(path)
        hit = cache.get(rel)
        if hit and hit[0] == _key(st):
            digest = hit[1]
        else:
            digest = sha256_file(path)
            hashed += st.st_size
        fresh[rel] = [_key(st), digest]
        files[rel] = [st.st_size, digest]
        total += st.st_size
    if fresh != cache:
        _save_cache(root, fresh)
    return {"files": files, "bytes": total, "hashed": hashed, "exists": True}


def seed(root, given):
    cache, seeded = _load_cache(root), 0
    for rel, (size, digest) in given.items():
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_size == size:
            cache[rel] = [_key(st), digest]
            seeded += 1
    _save_cache(root, cache)
    return {"seeded": seeded}


def _resident(fd, size):
    """Bytes of the file in the page cache (mincore over a read-only mapping); None if it cannot be told."""
    if size == 0:
        return 0
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        page = mmap.PAGESIZE
        p = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if p is None or p == ctypes.c_void_p(-1).value:
            return None
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            if libc.mincore(ctypes.c_void_p(p), size, vec) != 0:
                return None
            return sum(v & 1 for v in vec) * page
        finally:
            libc.munmap(ctypes.c_void_p(p), size)
    except Exception:  # noqa: BLE001 - residency is a report, never a reason to fail
        return None


def _mem_available(field="MemAvailable:"):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return None


def evict(root):
    out = {"files": 0, "bytes": 0, "cached_before": 0, "cached_after": 0, "mem_available_before": _mem_available()}
    if not os.path.isdir(root):
        out["exists"] = False
        out["mem_available_after"] = out["mem_available_before"]
        out["mem_free_after"] = _mem_available("MemFree:")
        return out
    unknown = False
    for _rel, path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            before = _resident(fd, size)
            _drop(fd)
            after = _resident(fd, size)
        finally:
            os.close(fd)
        out["files"] += 1
        out["bytes"] += size
        if before is None or after is None:
            unknown = True
        else:
            out["cached_before"] += before
            out["cached_after"] += after
    if unknown:
        out["cached_before"] = out["cached_after"] = None
    out["mem_available_after"] = _mem_available()
    out["mem_free_after"] = _mem_available("MemFree:")
    out["exists"] = True
    return out


def authorize(line):
    ssh_dir = os.path.join(os.path.expanduser("~"), ".ssh")
    os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(ssh_dir, "authorized_keys"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def unauthorize(marker):
    path = os.path.join(os.path.expanduser("~"), ".ssh", "authorized_keys")
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return {"removed": 0}
    keep = [ln for ln in lines if not ln.rstrip("\n").endswith(" " + marker)]
    if len(keep) != len(lines):
        tmp = path + ".sparkdeploy-tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
    return {"removed": len(lines) - len(keep)}


def main(argv):
    cmd = argv[0]
    if cmd == "manifest":
        res = manifest(argv[1])
    elif cmd == "seed":
        res = seed(argv[1], json.load(sys.stdin))
    elif cmd == "evict":
        res = evict(argv[1])
    elif cmd == "unauthorize":
        res = unauthorize(argv[1])
    elif cmd == "authorize":
        authorize(sys.stdin.read())
        res = {}
        if len(argv) > 1:
            os.makedirs(argv[1], exist_ok=True)
            res = manifest(argv[1])
    elif cmd == "finish":
        given = json.load(sys.stdin)
        res = {"seeded": seed(argv[1], given)["seeded"], "removed": unauthorize(argv[2])["removed"]}
        res["manifest"] = manifest(argv[1])
    else:
        raise SystemExit("unknown command %r" % cmd)
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
