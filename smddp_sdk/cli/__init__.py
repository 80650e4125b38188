"""``smddp-launch``: the command line (click). Never imports torch or the collectives."""
