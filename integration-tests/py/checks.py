"""The check counter the py-consul scripts share: `check` stops the script at the first failed
check (exit status non-zero, with what failed); `passed` prints how many held."""

_count = 0


def check(cond, what):
    global _count
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    _count += 1


def passed(label="py-consul"):
    print(f"{label}: {_count} checks passed")
