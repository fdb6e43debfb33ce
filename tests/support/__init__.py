"""What the tests share that is not a test: optional packages and how to install them (`optional`), cgroups
for a throttled disk and a memory limit (`cgroups`), the seeded orders' rules written from the documentation
(`rules`), a Lightning module (`lightning_model`), and mutation testing (`python tests/support/mutants.py`)."""
