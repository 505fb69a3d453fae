package joblog

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		"node-b:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/IB/0",
		"node-b:1:2 [0] transport/net_ib.cc:1302 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<12345> with error 12, opcode 0, len 0, vendor err 129 (Recv)",
		"node-b:1:2 [0] transport/net_ib.cc:1302 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<12346> with error 12, opcode 0, len 0, vendor err 129 (Recv)",
		"node-b:1:2 [0] transport/net_ib.cc:1302 NCCL WARN NET/IB : Got completion from peer 10.0.0.9<12346> with error 5, opcode 0, len 0, vendor err 244 (Recv)",
		"node-b:1:3 [1] NCCL WARN NET/IB : Got async event : port error",
		"node-b:1:3 [1] NCCL WARN Cuda failure 'out of memory'",
	}, "\n")
	fs, st, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if st.Lines != 6 || st.Matched != 4 || len(fs) != 3 {
		t.Fatalf("stats %+v, %d findings %+v", st, len(fs), fs)
	}
	if f := fs[0]; f.Count != 2 || f.Attrs["peer"] != "10.0.0.1" || f.Attrs["status"] != "12" || f.Attrs["vendor_err"] != "129" || f.Attrs["host"] != "node-b" {
		t.Errorf("first finding %+v", f)
	}
	if f := fs[1]; f.Count != 1 || f.Attrs["peer"] != "10.0.0.9" || f.Attrs["status"] != "5" {
		t.Errorf("second finding %+v", f)
	}
	if f := fs[2]; f.Attrs["error"] != "port error" || f.Attrs["peer"] != "" {
		t.Errorf("async event %+v", f)
	}
}
