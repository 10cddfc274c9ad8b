"""How a number is judged: the regression verdict and its policy, the roofline and the floors on it, the memory gate."""
