"""Where numbers are kept: baseline files and their entries, the recording journal, Triton autotune
choices, the environment header, a noise benchmark's saved runs read back."""
