"""psnode on rate-limited links between network namespaces: netbench.py (three hosts,
compression), clusterbench.py (nine hosts on one switch)."""
