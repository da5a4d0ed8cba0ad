"""A real node on this machine (containerd, CNI, kubelet, kube-proxy): see node.py."""
