"""A plain Flower app whose partition 0 corrupts its train replies (issue 46)."""
