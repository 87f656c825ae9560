"""``python -m spark_overlays check [--vllm-source DIR] [--json]``."""

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("check",):
        print("usage: python -m spark_overlays check [--vllm-source DIR] [--feature F] [--json]", file=sys.stderr)
        return 2
    from .check import main as check_main

    return check_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
