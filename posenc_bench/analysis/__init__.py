"""Tables, figures and the CI gate, built from results files only (they never train)."""
