"""Node-side helper for `weights fetch`: `python -c <this file> CMD ...`; one JSON object per line on stdout.

  download CACHE REPO_ID REVISION OFFLINE
        Inside a container of the pinned base image (it ships huggingface_hub with vLLM): huggingface_hub's own
        `snapshot_download` into the HF hub cache CACHE (a re-run skips the files completed before; a file
        cut off mid-way restarts with huggingface_hub 2.4, continues with versions that resume), token from $HF_TOKEN (the root-only env file), local files only when OFFLINE is 1.
        Prints {"progress": desc, "n", "total", "unit"} lines while downloading, then {"commit": sha,
        "token": whether one was given}, or
        {"error": kind, "message"} and exits 3 (kind: not_cached | not_found | gated | revision | other).
  place SNAPSHOT DEST DRY_RUN
        On the node itself (stdlib): make DEST hold the snapshot's files, each a hard link to its cache blob
        (no second copy on disk; a copy when the two are on different file systems), temp-then-rename per
        file. A file already there with the same bytes is left alone.
        Prints {"files", "bytes", "present", "linked", "copied"}.
"""

import filecmp
import json
import os
import shutil
import sys
import time

PROGRESS_EVERY_S = 1.0


def _say(**obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def download(cache, repo_id, revision, offline):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from tqdm.auto import tqdm

    class Lines(tqdm):
        """A bar that prints JSON lines (at most one a second per bar) instead of drawing itself."""

        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own tqdm takes a logger name
            kwargs["file"] = open(os.devnull, "w")
            super().__init__(*args, **kwargs)
            self._said = 0.0

        def update(self, n=1):
            out = super().update(n)
            if time.monotonic() - self._said >= PROGRESS_EVERY_S or (self.total and self.n >= self.total):
                self._said = time.monotonic()
                _say(progress=str(self.desc), n=self.n, total=self.total, unit=self.unit)
            return out

    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache, token=os.environ.get("HF_TOKEN"),
                                 local_files_only=offline, tqdm_class=Lines)
    except RevisionNotFoundError as err:
        return _fail("revision", err)
    except GatedRepoError as err:
        return _fail("gated", err)
    except RepositoryNotFoundError as err:
        return _fail("not_found", err)
    except LocalEntryNotFoundError as err:
        return _fail("not_cached", err)
    except Exception as err:  # noqa: BLE001 - reported as one line by the kit
        return _fail("other", err)
    _say(commit=os.path.basename(os.path.normpath(path)), token=bool(os.environ.get("HF_TOKEN")))
    return 0


def _fail(kind, err):
    _say(error=kind, message=f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
    return 3


def _snapshot_files(snapshot):
    for dirpath, dirnames, filenames in os.walk(snapshot):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            yield os.path.relpath(path, snapshot), os.path.realpath(path)


def _same(blob, dest):
    try:
        if os.path.samefile(blob, dest):
            return True
        return os.path.getsize(blob) == os.path.getsize(dest) and filecmp.cmp(blob, dest, shallow=False)
    except OSError:
        return False


def place(snapshot, dest, dry_run):
    counts = {"files": 0, "bytes": 0, "present": 0, "linked": 0, "copied": 0}
    for rel, blob in _snapshot_files(snapshot):
        target = os.path.join(dest, rel)
        counts["files"] += 1
        counts["bytes"] += os.path.getsize(blob)
        if _same(blob, target):
            counts["present"] += 1
            continue
        if dry_run:
            counts["linked"] += 1
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.sparkdeploy-fetch")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        try:
            os.link(blob, tmp)
            counts["linked"] += 1
        except OSError:  # another file system (EXDEV) or links refused (EPERM): a copy
            shutil.copyfile(blob, tmp)
            counts["copied"] += 1
        os.replace(tmp, target)
    _say(**counts)
    return 0


def main(argv):
    if argv[0] == "download":
        return download(argv[1], argv[2], argv[3], argv[4] == "1")
    if argv[0] == "place":
        if not os.path.isdir(argv[1]):
            _say(error="no_snapshot", message=f"{argv[1]} is not a directory")
            return 3
        return place(argv[1], argv[2], argv[3] == "1")
    _say(error="usage", message=f"unknown command {argv[0]!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
