"""The statistics room: everything a finding rests on, read by the findings, tables, gate and plots.

``distributions`` (t, binomial, exact tests, multiplicity corrections) -> ``estimate`` (an estimate, its interval
at any level and its p-value; a comparison) -> ``text`` (the bootstrap of the eval text, by document) ->
``intervals`` (the seed and text levels of every value and paired comparison of a results file) -> ``family``
(a set of comparisons corrected for their number). ``seeds`` reduces one cell over its seeds for the descriptive
tables.
"""
