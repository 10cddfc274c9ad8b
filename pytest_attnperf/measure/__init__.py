"""How a number is taken: sampling, the CUDA timer and graph capture, NVML clocks and power, the host
timer, case isolation and pool runs."""
