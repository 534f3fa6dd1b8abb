"""Small named policies: which children load a request, and when to stop calling a failing one."""
