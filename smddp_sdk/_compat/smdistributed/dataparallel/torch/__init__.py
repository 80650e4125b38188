"""`smdistributed.dataparallel.torch`: importing a submodule registers the smddp backend."""
