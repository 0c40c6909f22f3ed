package openai

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

func TestWriteError(t *testing.T) {
	param := "messages[2].content"
	tests := []struct {
		status    int
		code      string
		param     *string
		wantType  string
		wantParam string
	}{
		{400, CodeInvalidRequest, &param, "invalid_request_error", `"messages[2].content"`},
		{401, CodeInvalidAPIKey, nil, "authentication_error", "null"},
		{403, CodeInsufficientScope, nil, "permission_error", "null"},
		{404, CodeModelNotFound, nil, "not_found_error", "null"},
		{412, CodeETagMismatch, nil, "invalid_request_error", "null"},
		{413, CodeRequestTooLarge, nil, "invalid_request_error", "null"},
		{428, CodeIfMatchRequired, nil, "invalid_request_error", "null"},
		{429, "rate_limited", nil, "rate_limit_error", "null"},
		{500, "internal", nil, "server_error", "null"},
		{502, CodeUpstreamFailed, nil, "server_error", "null"},
		{503, CodeNoCapacity, nil, "service_unavailable", "null"},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, tt.status, tt.code, "bad <thing> & co", tt.param)
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d", rec.Code, tt.status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			var raw struct {
				Error map[string]json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
				t.Fatalf("body %s: %v", rec.Body, err)
			}
			want := map[string]string{
				"message": `"bad <thing> & co"`, "type": `"` + tt.wantType + `"`,
				"param": tt.wantParam, "code": `"` + tt.code + `"`,
			}
			if len(raw.Error) != len(want) {
				t.Fatalf("fields %v, want %v", raw.Error, want)
			}
			for k, v := range want {
				if string(raw.Error[k]) != v {
					t.Errorf("%s = %s, want %s", k, raw.Error[k], v)
				}
			}
		})
	}
}

func TestSSEError(t *testing.T) {
	got := string(SSEError(CodeUpstreamFailed, "engine failed mid-stream"))
	want := `data: {"error":{"message":"engine failed mid-stream","type":"server_error","param":null,"code":"upstream_failed"}}` + "\n\n"
	if got != want {
		t.Fatalf("SSEError =\n%q\nwant\n%q", got, want)
	}
}

func TestModelList(t *testing.T) {
	tests := []struct {
		name string
		list ModelList
		want string
	}{
		{"empty", NewModelList(nil), `{"object":"list","data":[]}`},
		{"two", NewModelList([]Model{NewModel("smol", 1700000000, "tlgate"), NewModel("big", 0, "tlgate")}),
			`{"object":"list","data":[{"id":"smol","object":"model","created":1700000000,"owned_by":"tlgate"},{"id":"big","object":"model","created":0,"owned_by":"tlgate"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.list)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Fatalf("got %s, want %s", b, tt.want)
			}
		})
	}
}

func TestMethodNotAllowed(t *testing.T) {
	rec := httptest.NewRecorder()
	MethodNotAllowed("GET, HEAD")(rec, httptest.NewRequest("DELETE", "/v1/models", nil))
	if rec.Code != 405 || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("status %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
	var body struct {
		Error struct{ Message, Code string }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Error.Code != CodeMethodNotAllowed || body.Error.Message != "DELETE is not allowed on /v1/models (allowed: GET, HEAD)." {
		t.Fatalf("error %+v", body.Error)
	}
}

func TestNextSequenceNumber(t *testing.T) {
	for _, tc := range []struct {
		in   string
		next int64
		want int64
	}{
		{`data: {"type":"response.created","sequence_number":0}` + "\n\n", 7, 1},
		{`data: {"sequence_number": 4}` + "\n\n" + `data: {"sequence_number":5,"type":"x"}` + "\n\n", 0, 6},
		{`data: {"delta":"\"sequence_number\":99","sequence_number":12}`, 0, 13},
		{`data: {"type":"response.created"}`, 3, 3},
		{`data: {"sequence_number":"x"}`, 2, 2},
	} {
		if got := NextSequenceNumber([]byte(tc.in), tc.next); got != tc.want {
			t.Errorf("NextSequenceNumber(%s, %d) = %d, want %d", tc.in, tc.next, got, tc.want)
		}
	}
}

func TestResponsesErrorEvent(t *testing.T) {
	got := string(ResponsesErrorEvent(CodeUpstreamFailed, "gone", 9))
	want := "event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_failed\",\"message\":\"gone\",\"param\":null,\"sequence_number\":9}\n\n"
	if got != want {
		t.Fatalf("ResponsesErrorEvent = %q, want %q", got, want)
	}
}
