"""The hand-written reading of an experiment (DIR/reading.md), appended to its report."""


def reading(directory):
    """Lines to append to a report: a blank line and the reading, or nothing when there is none."""
    try:
        return ["", open(f"{directory}/reading.md").read()]
    except FileNotFoundError:
        return []
