"""The timing room: `posenc-bench time`'s suite, its timer and its floor and references."""
