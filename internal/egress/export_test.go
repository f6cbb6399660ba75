package egress

// Full reports whether p's accept loop waits for a free MaxConns slot.
func Full(p *Proxy) bool { return p.full.Load() }
