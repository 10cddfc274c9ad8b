"""What the machine can do: the hardware table, device matching and the measured ceilings."""
