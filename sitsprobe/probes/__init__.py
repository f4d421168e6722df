"""Everything that loads BPF lives here: the only package that imports bcc."""
