"""specfleet's sandbox: the whole product on one machine, with emulated GPU engines and real traffic.

The e2e tier and `make demo` share these parts: a kubelet stand-in that plays each pod with a local
process (`pods`), pod discovery for Debian's Prometheus (`discovery`, `prometheus`), the operator as a
process (`processes`), a load generator on the official openai client (`load`), scripted scenarios
(`scenario`) and the `specfleet sandbox` command (`cli`).
"""
