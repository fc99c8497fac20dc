-- Hookline schema, version 4: what the operator needs.

-- Annotation tokens the operator has acted on (replay-dlq, rotate-secret). The
-- token is recorded in the same transaction as the replay, so a token is handled
-- once even if the operator dies before it writes the resource's status.
CREATE TABLE hookline.operator_tokens (
    provider    text NOT NULL,
    kind        text NOT NULL,
    token       text NOT NULL,
    handled_at  timestamptz NOT NULL DEFAULT now(),
    result      jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (provider, kind, token)
);
